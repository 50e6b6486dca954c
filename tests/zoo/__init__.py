"""The model zoo: real architectures from torchvision, timm and transformers, exported and trained (issue 12)."""
