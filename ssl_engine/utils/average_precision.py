"""Average precision of one class from scores and 1 / 0 / -1 labels: the one implementation
behind the mean-AP meter (meters/mean_ap_list_meter.py) and the SVM evaluation
(evaluation/svm.py), each of which says what a class without positives gives."""
import numpy as np

PRESENT, ABSENT, IGNORED = 1, 0, -1


def average_precision(scores, labels, *, no_positives: float, interpolated: bool = False
                      ) -> float:
    """AP of one class from ``scores`` and labels 1/0/-1 (-1 rows left out), numpy arrays or
    CPU tensors: the precision at each distinct score threshold (tied scores form one) weighted
    by the recall gained there; ``interpolated`` takes the best precision at that recall or
    beyond. ``no_positives`` when no sample is positive."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    known = labels != IGNORED
    scores, positive = scores[known], (labels[known] == PRESENT).astype(np.float64)
    num_positives = positive.sum()
    if num_positives == 0:
        return no_positives
    order = np.argsort(-scores, kind="stable")
    scores, positive = scores[order], positive[order]
    true_pos = np.cumsum(positive)
    last_of_tie = np.r_[scores[1:] != scores[:-1], True]
    precision = (true_pos / np.arange(1, len(scores) + 1))[last_of_tie]
    recall = true_pos[last_of_tie] / num_positives
    if interpolated:
        precision = np.maximum.accumulate(precision[::-1])[::-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))
