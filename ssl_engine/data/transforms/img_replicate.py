from ssl_engine.data.registry import register_transform


@register_transform("ImgReplicatePil")
class ImgReplicatePil:
    """One image -> a list of ``num_times`` copies (the views later transforms augment apart)."""

    makes_views = True

    def __init__(self, num_times: int = 2):
        if num_times < 1:
            raise ValueError(f"num_times must be >= 1, got {num_times}")
        self.num_times = num_times

    def __call__(self, image):
        return [image.copy() for _ in range(self.num_times)]

    def __repr__(self) -> str:
        return f"ImgReplicatePil(num_times={self.num_times})"
