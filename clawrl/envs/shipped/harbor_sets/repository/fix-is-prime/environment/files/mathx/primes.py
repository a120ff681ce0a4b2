def is_prime(n):
    return all(n % d for d in range(2, n // 2))
