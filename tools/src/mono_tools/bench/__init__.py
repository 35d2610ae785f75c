"""`mono bench`: kernel time under graph replay against the op-by-op path and the memory limit."""
