"""TEVI's reproductions: the MAD CLIP, TEVI on MAD (synthetic) and on COCO (real data)."""
