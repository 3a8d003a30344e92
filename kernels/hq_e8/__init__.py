"""hq-e8-2b: the compressed KV format (E8-lattice codes at 2 bits per value plus a scale per 64).

``codebook.py`` defines the 2**16 points and their 16-bit codes, ``codec.py``
the rotation, the page-row layout and torch encode/decode, ``reference.py``
the torch twins of the ops (quantize-on-write, exact-window write, decode and
prefill attention over compressed pages plus the exact window), and the
``triton_*.py`` files their Triton forms.
"""
