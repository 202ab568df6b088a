"""`python -m kernels.build`: builds the Mojo kernels (kernels/build/modules.py)."""

from kernels.build.modules import main

main()
