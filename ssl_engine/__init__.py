"""ssl_engine: self-supervised pretraining and evaluation of vision models."""
__version__ = "0.1.0"
