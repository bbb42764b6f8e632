"""Reference engine of kvcached (issue 12): SmolLM2-135M-Instruct in Python + numpy.

Modules: gguf (GGUF reader, dequantization), tokenizer (GPT-2 byte-level BPE
from the GGUF metadata, ChatML), kv (KV stores: contiguous and paged over a
block allocator), model (the Llama decoder, sampling, generate).
Import with examples/ on sys.path: `from engine import model`."""
