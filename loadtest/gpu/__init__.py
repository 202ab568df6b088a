"""The GPU session's tooling: the bundle carried to a GPU machine, the one-call check, and the GPU benchmarks."""
