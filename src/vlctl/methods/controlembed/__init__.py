"""ControlEmbed: a hypernetwork from an attribute's text to an affine map of a frozen space."""
