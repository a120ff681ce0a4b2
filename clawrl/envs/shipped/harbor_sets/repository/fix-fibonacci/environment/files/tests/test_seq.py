import unittest

from mathx.seq import fib


class FibTest(unittest.TestCase):
    def test_zero(self):
        self.assertEqual(fib(0), 0)

    def test_ten(self):
        self.assertEqual(fib(10), 55)

    def test_two(self):
        self.assertEqual(fib(2), 1)
