import unittest

from mathx.primes import is_prime


class PrimeTest(unittest.TestCase):
    def test_one(self):
        self.assertFalse(is_prime(1))

    def test_four(self):
        self.assertFalse(is_prime(4))

    def test_zero(self):
        self.assertFalse(is_prime(0))
