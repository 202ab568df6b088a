"""llama.cpp's quantized weight blocks and their repacking into the kernels' tiles: the layout the kernels read."""
