"""Transforms: any torchvision.transforms class by name plus the registered SSL ones below."""
from ssl_engine.data.transforms import (  # noqa: F401  (importing registers them)
    color_distortion,
    fast_blur,
    gaussian_blur,
    ijepa_aim_masking,
    img_replicate,
    jigsaw,
    lab,
    masking,
    multicrop,
    multicrop_random_apply,
    one_hot_encode,
    patches_and_image,
    photometric,
    rand_augment,
    resize,
    rotate,
    solarize,
    to_tensor,
)
from ssl_engine.data.transforms.chain import (  # noqa: F401
    TransformChain,
    build_transforms,
    known_transforms,
)
