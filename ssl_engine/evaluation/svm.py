"""Linear SVM evaluation of extracted features (the protocol of VISSL's ``SVM`` settings).

For every class, a one-vs-rest ``sklearn.svm.LinearSVC`` is trained for each cost C of the cost
list; the C whose ``cross_val_folds``-fold cross-validated average precision on the train
features is highest (the first on ties) is kept, and its model, fitted on all train features,
scores the test features. Positives weigh twice the negatives (``class_weight={1: 2, -1: 1}``),
the tolerance is 1e-4, and the solver's random state is fixed, so runs repeat exactly.

Targets are either class indices (``[N]``, single-label: class c is present in a sample whose
target is c, absent elsewhere) or a ``[N, C]`` matrix with 1 (present), 0 (absent) and -1
(ignored: VOC's "difficult" objects). Ignored samples count as negatives when training, as in
VISSL, and are left out of the test AP.

Test AP per class (``ssl_engine.utils.average_precision``; NaN for a class without positives)
is the area under the precision-recall curve taken at every distinct score
(``sklearn.metrics.average_precision_score``); the interpolated variant uses, at each recall,
the best precision at that recall or beyond (the AP VISSL's SVM benchmark reports). For
single-label targets the top-1 accuracy of the highest-scoring class is reported too.

Trained models are stored as ``.npz`` files of plain arrays (weights, bias, cross-validation
AP and a fingerprint of the data and settings they were trained on), never pickles.
"""
import hashlib
import json
import logging
import math
import warnings
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ssl_engine.utils.average_precision import ABSENT, IGNORED, PRESENT, average_precision
from ssl_engine.utils.progress import Progress

logger = logging.getLogger(__name__)

NO_POSITIVE_AP = float("nan")  # the AP of a class without positives: mean_ap leaves it out
POSITIVE_CLASS_WEIGHT = 2.0
TOLERANCE = 1e-4
RANDOM_STATE = 0
NORM_EPS = 1e-5


class SVMSettings(NamedTuple):
    costs: Tuple[float, ...] = (0.1, 0.01)
    normalize: bool = True
    loss: str = "squared_hinge"
    penalty: str = "l2"
    dual: bool = True
    max_iter: int = 2000
    cross_val_folds: int = 3

    @classmethod
    def from_config(cls, svm) -> "SVMSettings":
        """The settings of a config's ``SVM`` section."""
        costs = svm_costs(svm.costs.costs_list, svm.costs.base, svm.costs.power_range)
        return cls(costs=tuple(costs), normalize=bool(svm.normalize), loss=str(svm.loss),
                   penalty=str(svm.penalty), dual=bool(svm.dual), max_iter=int(svm.max_iter),
                   cross_val_folds=int(svm.cross_val_folds))


class LinearModel(NamedTuple):
    weight: np.ndarray  # [D] float64
    bias: float

    def decision(self, features: np.ndarray) -> np.ndarray:
        return features @ self.weight + self.bias


class ClassResult(NamedTuple):
    crossval_ap: List[float]  # one per cost
    chosen: int  # index of the chosen cost
    model: LinearModel  # trained with the chosen cost


def svm_costs(costs_list: Sequence[float], base: float = -1.0,
              power_range: Sequence[int] = (4, 20)) -> List[float]:
    """``costs_list``, then ``base ** p`` for p in ``range(*power_range)`` when ``base > 0``."""
    costs = [float(c) for c in costs_list]
    if base > 0:
        start, end = (int(p) for p in power_range)
        costs += [float(base) ** p for p in range(start, end)]
    if not costs:
        raise ValueError("SVM.costs gives no cost: set SVM.costs.costs_list or SVM.costs.base")
    bad = [c for c in costs if not c > 0 or not math.isfinite(c)]
    if bad:
        raise ValueError(f"SVM costs must be positive and finite, got {bad}")
    return costs


def normalize_features(features: np.ndarray) -> np.ndarray:
    """Rows divided by their l2 norm (+1e-5), in float64."""
    features = np.asarray(features, dtype=np.float64)
    return features / (np.linalg.norm(features, axis=1, keepdims=True) + NORM_EPS)


def class_targets(targets: np.ndarray, num_classes: Optional[int] = None) -> np.ndarray:
    """``[N, C]`` int8 targets of 1 (present), 0 (absent), -1 (ignored): a matrix is checked
    and returned; class indices ``[N]`` become one-hot rows over ``num_classes`` classes."""
    targets = np.asarray(targets)
    if targets.ndim == 2:
        if not np.isin(targets, (PRESENT, ABSENT, IGNORED)).all():
            raise ValueError("multi-label SVM targets must be 1 (present), 0 (absent) or -1 "
                             "(ignored)")
        return targets.astype(np.int8)
    if targets.ndim != 1:
        raise ValueError(f"SVM targets must be [N] class indices or an [N, C] matrix, got "
                         f"shape {targets.shape}")
    if targets.size and targets.min() < 0:
        raise ValueError(f"single-label SVM targets must be class indices >= 0, found "
                         f"{int(targets.min())}")
    num_classes = int(num_classes if num_classes is not None else targets.max() + 1)
    return (targets[:, None] == np.arange(num_classes)[None, :]).astype(np.int8)


def mean_ap(per_class: Sequence[float]) -> float:
    """Mean over the classes that have an AP (not NaN); NaN when none has."""
    valid = [ap for ap in per_class if not math.isnan(ap)]
    return float(np.mean(valid)) if valid else float("nan")


def make_svm(cost: float, settings: SVMSettings):
    from sklearn.svm import LinearSVC

    return LinearSVC(C=float(cost), class_weight={1: POSITIVE_CLASS_WEIGHT, -1: 1.0},
                     intercept_scaling=1.0, penalty=settings.penalty, loss=settings.loss,
                     dual=settings.dual, tol=TOLERANCE, max_iter=settings.max_iter,
                     random_state=RANDOM_STATE)


def check_settings(settings: SVMSettings) -> None:
    """Raise ValueError now for settings scikit-learn would refuse only when training (e.g.
    ``penalty=l1`` with ``loss=hinge``)."""
    if settings.cross_val_folds < 2:
        raise ValueError(f"SVM.cross_val_folds must be at least 2, got {settings.cross_val_folds}")
    toy = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_svm(settings.costs[0], settings).fit(toy, np.array([1, 1, -1, -1]))
    except ValueError as err:
        raise ValueError(f"SVM settings (loss={settings.loss}, penalty={settings.penalty}, "
                         f"dual={settings.dual}) are refused by LinearSVC: {err}") from None


def svm_labels(labels: np.ndarray) -> np.ndarray:
    """Training labels of one class: +1 for present, -1 for absent and ignored."""
    return np.where(np.asarray(labels) == PRESENT, 1, -1).astype(np.int32)


def _fit(svm, features, labels, what: str):
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        svm.fit(features, labels)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        logger.warning("%s did not converge in SVM.max_iter iterations", what)
    return svm


def crossval_ap(features: np.ndarray, labels: np.ndarray, cost: float,
                settings: SVMSettings) -> float:
    """Mean AP over ``settings.cross_val_folds`` stratified folds (scikit-learn's
    ``cross_val_score`` with ``scoring="average_precision"``) of the SVM of ``cost``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import cross_val_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        scores = cross_val_score(make_svm(cost, settings), features, svm_labels(labels),
                                 cv=settings.cross_val_folds, scoring="average_precision")
    return float(np.mean(scores))


def train_svm(features: np.ndarray, labels: np.ndarray, cost: float, settings: SVMSettings,
              what: str = "SVM") -> LinearModel:
    svm = _fit(make_svm(cost, settings), features, svm_labels(labels), what)
    return LinearModel(svm.coef_.ravel().astype(np.float64), float(svm.intercept_[0]))


def data_fingerprint(features: np.ndarray, targets: np.ndarray, settings: SVMSettings) -> str:
    """A hash of the train features, their targets and the settings a model depends on
    (all but the cost, which names the model's file)."""
    digest = hashlib.sha256()
    kept = {k: v for k, v in settings._asdict().items() if k != "costs"}
    digest.update(json.dumps(kept, sort_keys=True).encode())
    for array in (features, targets):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


class ModelStore:
    """Trained SVMs in ``folder``, one ``cls<c>_cost<C>.npz`` per class and cost, reused only
    when trained on the data and settings of ``fingerprint`` (unless ``force_retrain``)."""

    def __init__(self, folder, fingerprint: str, force_retrain: bool = False):
        self.folder, self.fingerprint = Path(folder), fingerprint
        self.force_retrain = force_retrain
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, cls: int, cost: float) -> Path:
        return self.folder / f"cls{cls}_cost{float(cost)}.npz"

    def load(self, cls: int, cost: float) -> Optional[Tuple[float, LinearModel]]:
        path = self.path(cls, cost)
        if self.force_retrain or not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as saved:
                if str(saved["fingerprint"]) != self.fingerprint:
                    logger.info("%s was trained on other features or settings: training again",
                                path.name)
                    return None
                return (float(saved["crossval_ap"]),
                        LinearModel(saved["weight"].astype(np.float64), float(saved["bias"])))
        except (OSError, KeyError, ValueError) as err:
            logger.warning("cannot read %s (%s): training again", path, err)
            return None

    def save(self, cls: int, cost: float, ap: float, model: LinearModel) -> None:
        path = self.path(cls, cost)
        tmp = path.with_name(f".{path.stem}.tmp.npz")
        np.savez(tmp, weight=model.weight, bias=np.float64(model.bias),
                 crossval_ap=np.float64(ap), cost=np.float64(cost),
                 fingerprint=np.array(self.fingerprint))
        tmp.replace(path)


def train_class(features: np.ndarray, labels: np.ndarray, cls: int, settings: SVMSettings,
                store: Optional[ModelStore] = None) -> ClassResult:
    """Cross-validate and fit the SVM of every cost for one class (labels 1/0/-1); keep the
    cost of the best cross-validated AP."""
    num_pos = int((labels == PRESENT).sum())
    if num_pos == 0 or num_pos == len(labels):
        raise ValueError(f"class {cls} has {num_pos} positive train samples of {len(labels)}: "
                         "an SVM needs both positives and negatives (see SVM.cls_list)")
    aps, models = [], []
    for cost in settings.costs:
        cached = store.load(cls, cost) if store is not None else None
        if cached is not None:
            ap, model = cached
            logger.info("class %d cost %g: reusing the saved model (cross-val AP %.4f)",
                        cls, cost, ap)
        else:
            ap = crossval_ap(features, labels, cost, settings)
            model = train_svm(features, labels, cost, settings, f"class {cls} cost {cost:g}")
            logger.info("class %d (%d positives of %d) cost %g: cross-val AP %.4f", cls,
                        num_pos, len(labels), cost, ap)
            if store is not None:
                store.save(cls, cost, ap, model)
        aps.append(ap)
        models.append(model)
    chosen = int(np.argmax(aps))
    return ClassResult(aps, chosen, models[chosen])


def svm_eval(
    train_features: np.ndarray,
    train_targets: np.ndarray,
    test_features: np.ndarray,
    test_targets: np.ndarray,
    settings: SVMSettings = SVMSettings(),
    classes: Sequence[int] = (),
    model_dir=None,
    force_retrain: bool = False,
) -> Dict[str, object]:
    """Train the SVMs of ``classes`` (empty: all) on the train split and test them.

    Returns ``{"classes", "costs", "crossval_ap" [class][cost], "chosen_cost" [class],
    "test_ap" [class] (NaN for a class without test positive), "mAP", "mAP_interpolated"}``
    (percentages), plus ``"top1"`` (%) for single-label targets when every class is trained.
    ``model_dir``: where the models are saved and reused from."""
    single_label = np.asarray(train_targets).ndim == 1
    num_classes = None
    if single_label:
        num_classes = int(max(np.max(train_targets), np.max(test_targets))) + 1
    train_y = class_targets(train_targets, num_classes)
    test_y = class_targets(test_targets, num_classes)
    if train_y.shape[1] != test_y.shape[1]:
        raise ValueError(f"train targets have {train_y.shape[1]} classes, test targets "
                         f"{test_y.shape[1]}")
    if len(train_y) != len(train_features) or len(test_y) != len(test_features):
        raise ValueError("SVM features and targets have different numbers of rows")
    train_shape, test_shape = np.shape(train_features), np.shape(test_features)
    if len(train_shape) != 2 or len(test_shape) != 2 or train_shape[1] != test_shape[1]:
        raise ValueError(
            f"the SVM's train features are of shape {tuple(train_shape)} and its test features "
            f"of shape {tuple(test_shape)}: both must be [rows, dims] of one width, the same "
            "layer of the same model (extract both splits with one config and checkpoint)")
    num_classes = train_y.shape[1]
    classes = [int(c) for c in classes] or list(range(num_classes))
    outside = [c for c in classes if not 0 <= c < num_classes]
    if outside:
        raise ValueError(f"SVM.cls_list names classes {outside}; the targets have "
                         f"{num_classes} classes (0 to {num_classes - 1})")
    check_settings(settings)

    prepare = normalize_features if settings.normalize else (
        lambda x: np.asarray(x, dtype=np.float64))
    train_x, test_x = prepare(train_features), prepare(test_features)
    store = None
    if model_dir is not None:
        store = ModelStore(model_dir, data_fingerprint(train_x, train_y, settings), force_retrain)
    logger.info("training SVMs for %d classes, costs %s, on %d x %d features", len(classes),
                list(settings.costs), *train_x.shape)

    results, test_scores = [], []
    progress = Progress("training SVMs", len(classes), unit="classes")  # every 10 s at most
    for cls in classes:
        result = train_class(train_x, train_y[:, cls], cls, settings, store)
        results.append(result)
        test_scores.append(result.model.decision(test_x))
        progress.update()
    test_ap = [average_precision(s, test_y[:, c], no_positives=NO_POSITIVE_AP)
               for s, c in zip(test_scores, classes)]
    test_ap_interp = [average_precision(s, test_y[:, c], no_positives=NO_POSITIVE_AP,
                                        interpolated=True) for s, c in zip(test_scores, classes)]
    for cls, ap, result in zip(classes, test_ap, results):
        logger.info("class %d: cost %g, test AP %.4f", cls, settings.costs[result.chosen], ap)
    out = {
        "classes": classes,
        "costs": list(settings.costs),
        "crossval_ap": [r.crossval_ap for r in results],
        "chosen_cost": [settings.costs[r.chosen] for r in results],
        "test_ap": test_ap,
        "mAP": 100.0 * mean_ap(test_ap),
        "mAP_interpolated": 100.0 * mean_ap(test_ap_interp),
    }
    if single_label and len(classes) == num_classes:
        predicted = np.asarray(classes)[np.argmax(np.stack(test_scores, axis=1), axis=1)]
        out["top1"] = 100.0 * float(np.mean(predicted == np.asarray(test_targets)))
    return out
