"""Sphinx configuration of the course website (copied into build/site-src/ by scripts/build_site.py).

Sphinx + MyST-NB render the executed lessons as they are (nothing is executed here); furo is the
theme (search, next/previous links); MathJax comes from sphinx-mathjax-offline and plotly.js from
the plotly package, both copied into the site, so it works offline and from a plain file server.
"""

project = "paged_edu"
html_title = "paged_edu"
extensions = ["myst_nb", "sphinx-mathjax-offline"]

# The lessons arrive executed (scripts/run_lessons.py); the site only renders them.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

html_theme = "furo"
html_static_path = ["_static"]
html_js_files = ["plotly.min.js", "plotly-figures.js", "code-lines.js"]
html_css_files = ["site.css"]
html_favicon = "_static/favicon.svg"
html_extra_path = ["_extra"]  # the clean notebooks, for the "Download notebook" links
html_show_sourcelink = False
html_copy_source = False
html_theme_options = {"navigation_with_keys": True}

exclude_patterns = ["_extra", "**.ipynb_checkpoints"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header", "toc.not_included"]  # records copied in as they are
