"""ControlEmbed's reproductions: Clevr-4-like shapes (synthetic) and the real datasets."""
