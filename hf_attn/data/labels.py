"""Label conventions every dataset here follows."""

IGNORE_INDEX = -100  # a label the loss skips (transformers' convention), e.g. every position but `<eos>`
