"""The fixed-size encodings a training step uses on the device, and their records.

Two layouts of quantization codes, both sized before a kernel runs so nothing is read
back to the host: fixed-width codes (``codes.py``) and tile codes (``tiles.py``, each
tile of 256 elements at its own width), and a GELU output held as its residual against
its restored input (``gelu_ops.py``, ``gelu.py``). Each layout has a torch reference
(``*_torch.py``, any device) and Triton kernels (``*_triton.py``, CUDA) that write the
same bytes, behind the ``torch.library`` custom ops of ``ops.py`` and ``gelu_ops.py``.
The records the saved-tensor hooks hold: ``code_records.py``, ``code_offload.py``,
``tile_records.py``, ``tile_offload.py``; which bound each tensor gets: ``bounds.py``.
"""
