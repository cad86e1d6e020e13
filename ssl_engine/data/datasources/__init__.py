"""Data sources: ``source[i] -> (RGB PIL image, label)``, the label an int or a label row;
importing registers them."""
from ssl_engine.data.datasources import (  # noqa: F401
    digits, disk_filelist, disk_folder, disk_roi_annotations, synthetic, torchvision_dataset)
from ssl_engine.data.datasources.image_io import ImageLoadError, load_rgb_image  # noqa: F401
