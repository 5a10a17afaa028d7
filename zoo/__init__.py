"""The tiny model zoo: corpus, tokenizer and target training for the embedded models."""
