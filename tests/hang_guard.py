"""The suite's one hang guard: the bound on every wait in the tests -- a condition in the browser
(the kernel idle and every cell's execution count set, a plot's DOM drawn, a widget's effect on a
plot), a subprocess, a server answering, a kernel starting, a notebook cell running.

It is not a guess at how fast the machine is: every wait ends as soon as its condition holds, and
this bound only turns a hang into a failure. Ten minutes is several times the longest single wait
the suite has (a lesson's Run All in JupyterLab, on a 2-core machine also running other work).

pytest-timeout's per-test limit (``timeout`` in ``[tool.pytest.ini_options]``) is the guard around a
whole test: twice this, so that a wait's own error, naming its condition, comes first -- and an nbval
cell, whose first item also starts the kernel (both bounded by this), is interrupted by nbval
(traceback kept, kernel alive for the next cell) before pytest-timeout fails it.
"""

HANG_GUARD_S = 600
