"""3VL's reproductions: compositional scenes, the LiT recipe (synthetic) and COCO (real data)."""
