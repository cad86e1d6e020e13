"""Data sources: ``source[i] -> (RGB PIL image, int label)``; importing registers them."""
from ssl_engine.data.datasources import digits, disk_filelist, disk_folder, synthetic  # noqa: F401
from ssl_engine.data.datasources.image_io import ImageLoadError, load_rgb_image  # noqa: F401
