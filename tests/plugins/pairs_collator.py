"""A collator registered by a plugin (``SSL_ENGINE_PLUGINS=plugins.pairs_collator``): the
default collator under the user's own name."""
from ssl_engine.data import register_collator
from ssl_engine.data.collators.default import default_collator

register_collator("pairs_collator")(default_collator)
