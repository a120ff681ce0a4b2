def clamp(x, low, high):
    return max(high, min(low, x))
