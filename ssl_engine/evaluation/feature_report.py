"""A plain-text table of feature evaluation results, one row per kind of features."""
from typing import Mapping, Sequence

ROW_NAMES = {"learned": "learned", "random_init": "random init", "raw_pixels": "raw pixels"}


def feature_report_table(results: Mapping[str, Mapping], shots: Sequence[int]) -> str:
    """Aligned columns ``features | kNN top-1 | <shot>-shot ...`` for
    ``results = {row: {"knn_top1": %, "low_shot": {shot: {"mean": %, "std": %}}}}``; rows keep
    their order and are named by ROW_NAMES when listed there."""
    header = ["features", "kNN top-1"] + [f"{shot}-shot" for shot in shots]
    rows = [header]
    for key, entry in results.items():
        cells = [ROW_NAMES.get(key, key), f"{entry['knn_top1']:.2f}"]
        for shot in shots:
            stats = entry["low_shot"][shot]
            cells.append(f"{stats['mean']:.2f} ± {stats['std']:.2f}")
        rows.append(cells)
    widths = [max(len(row[col]) for row in rows) for col in range(len(header))]
    lines = []
    for row in rows:
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join([first] + rest))
    return "\n".join(lines)
