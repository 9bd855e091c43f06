"""Performance benchmarks, each a module run as `python -m benchmarks.<name>` on CPU or CUDA.

`attention_layer` (one local layer's kernels), `throughput` (training speed and memory of whole models) and
`generation` (decoding latency and cache size) each own their measurements and print Markdown tables of ratios
against a baseline run alongside; `gpu` runs a planned list of them within a time budget.
"""
