"""Linear probes: what a frozen embedding holds, read by a logistic regression fitted on it.

A probe's test accuracy bounds what any linear read-out of the embedding (a projection head, a
text tower's dot product) can get from it: an adapter on the text side cannot recover what the
image embedding does not carry. The same probe on a control (raw pixels, an attribute the model is
trained to carry) tells a missing signal from a probe too weak for the data.
"""

from __future__ import annotations

import numpy as np


def linear_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, C: float | None = None,
                 cv: int = 5, seed: int = 0) -> np.ndarray:
    """(n_test,) labels predicted for `test_x` (n_test, d) by a logistic regression fitted on
    `train_x` (n_train, d), `train_y` (n_train,). `C` the inverse L2 strength; None chooses it among 8
    values (1e-4 .. 1e4, log-spaced) by `cv`-fold cross-validated accuracy on the training rows
    (fewer folds when a class has fewer rows; C = 1 when it has one). One class in `train_y`: every
    prediction is that class.

    One BLAS thread: the products are small (10,000 x 64), and OpenBLAS's threads spin-wait for each
    other; measured on 2 busy cores, 2.3 s with one thread against 105 s with two."""
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    classes, counts = np.unique(train_y, return_counts=True)
    if len(classes) < 2 or len(test_x) == 0:
        return np.full(len(test_x), classes[0] if len(classes) else -1, dtype=np.asarray(train_y).dtype)
    cv = min(cv, int(counts.min()))
    with threadpool_limits(1):
        if C is None and cv < 2:
            C = 1.0
        if C is None:
            folds = StratifiedKFold(cv, shuffle=True, random_state=seed)
            clf = LogisticRegressionCV(Cs=8, cv=folds, max_iter=4000, l1_ratios=(0.0,),
                                       scoring="accuracy", use_legacy_attributes=False)
        else:
            clf = LogisticRegression(max_iter=2000, C=C)
        return clf.fit(train_x, train_y).predict(test_x)
