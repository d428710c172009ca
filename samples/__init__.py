"""Sample media made in code (``scenes``: synthetic scenes with exact ground truth) and runnable examples
(``examples/``)."""
