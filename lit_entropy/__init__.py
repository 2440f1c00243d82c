"""lit-entropy: RLVR for language models with policy entropy measured and steered."""
__version__ = "0.1.0"
