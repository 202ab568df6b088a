"""`python -m kernels.builder`: builds the Mojo kernels (kernels/builder/modules.py)."""

from kernels.builder.modules import main

main()
