"""What the test modules share besides fixtures: models (``models``), eager references and
tree comparisons (``references``), the random programs of the fuzzer (``fuzzing``), driving
JupyterLab in a real browser (``jupyter``) and reading the package's import graph
(``imports``)."""
