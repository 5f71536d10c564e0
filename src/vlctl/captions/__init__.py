"""The caption language: caption trees with one-word hard negatives, the parse they are built
from, WordNet, and the anchor text of two captions. No model and no torch: 3VL, `vlctl tree`,
`vlctl audit` and the web page read it."""
