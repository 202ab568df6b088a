"""The model body: the decoder, its layers and the operations around its matmuls, packed linears, dtype and device
choice, weight loading."""
