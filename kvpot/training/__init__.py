"""Training kvpot's trained pieces (torch, from the optional `train` extra; never needed to run kvpot)."""
