"""vlctl: make CLIP-style vision-language embedding spaces controllable with text.

Pipeline: data -> encoders -> methods -> eval -> report / index / serve.
"""

__version__ = "0.1.0"
