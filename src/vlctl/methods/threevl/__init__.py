"""3VL's model side: tree-loss LoRA fine-tuning and the relevancy maps that explain it."""
