"""The attention family: two contractions with a row softmax between."""
