"""Finding again, after a read, the passages of the input a question needs (kvpot.session.locating chooses
between the locators): keys.py the model's own representative keys per block, kept during the read."""
