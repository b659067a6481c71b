"""The use-case layer: one function per run, typed inputs in, a typed report out; no printing."""
