"""RandAugment's ``weight_choice: 0`` (VISSL's weighted choice of the operations)."""
import numpy as np
import pytest
from PIL import Image

from ssl_engine.data import build_transforms

# The published table, written out: probability of each operation by its plain name.
TABLE = {"Rotate": 0.3, "ShearX": 0.2, "ShearY": 0.2, "TranslateXRel": 0.1,
         "TranslateYRel": 0.1, "Color": 0.025, "Sharpness": 0.025, "AutoContrast": 0.025,
         "Solarize": 0.005, "SolarizeAdd": 0.005, "Contrast": 0.005, "Brightness": 0.005,
         "Equalize": 0.005, "Posterize": 0.0, "Invert": 0.0}


def weighted(**params):
    pipeline = build_transforms([{"name": "RandAugment", "weight_choice": 0, **params}])
    return pipeline.transforms[0].transform if hasattr(pipeline, "transforms") else pipeline


@pytest.mark.parametrize("increasing", [False, True])
def test_single_draw_frequencies_follow_the_table(increasing):
    chooser = weighted(magnitude=5, num_layers=1, increasing_severity=increasing)
    names = [op.name.replace("Increasing", "") for op in chooser.ops]
    assert sorted(names) == sorted(TABLE)
    np.random.seed(0)
    draws = 20000
    counts = np.bincount([chooser.choose()[0] for _ in range(draws)], minlength=len(names))
    for name, count in zip(names, counts):
        p = TABLE[name]
        # within 5 standard deviations of the binomial count (and exactly 0 for p = 0)
        assert abs(count - draws * p) <= 5 * np.sqrt(draws * p * (1 - p)) + 1e-9, name


def test_two_layers_are_distinct_and_never_posterize_or_invert():
    chooser = weighted(magnitude=5, num_layers=2)
    np.random.seed(1)
    names = [op.name for op in chooser.ops]
    pairs = [chooser.choose() for _ in range(2000)]
    assert all(a != b for a, b in pairs)
    drawn = {names[i] for pair in pairs for i in pair}
    assert not drawn & {"Posterize", "Invert"}
    # without replacement: P(Rotate among the two) = p + sum_j p_j * p / (1 - p_j)
    probs = np.array([TABLE[n] for n in names])
    r = names.index("Rotate")
    expected = probs[r] + sum(probs[j] * probs[r] / (1 - probs[j])
                              for j in range(len(names)) if j != r)
    seen = np.mean([r in pair for pair in pairs])
    assert abs(seen - expected) < 5 * np.sqrt(expected * (1 - expected) / len(pairs))


def test_weighted_choice_transforms_an_image_and_refuses_unknown_tables():
    np.random.seed(2)
    image = Image.fromarray(np.random.RandomState(0).randint(0, 255, (16, 16, 3), np.uint8))
    out = weighted(magnitude=9)(image)
    assert out.size == image.size
    with pytest.raises(Exception, match="weight_choice=1"):
        build_transforms([{"name": "RandAugment", "weight_choice": 1}])
