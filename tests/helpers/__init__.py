"""What the test modules share besides fixtures: models (``models`` for the shared ones, then one
module per theme: ``export_models``, ``swap_models``, ``check_models``, ``pattern_models``,
``view_models``, ``grad_models``, ``deploy_models``; test modules define no model of their
own), eager references and tree comparisons (``references``), the random programs of the fuzzer
(``fuzzing``), driving JupyterLab in a real browser (``jupyter``) and reading the package's
import graph (``imports``)."""
