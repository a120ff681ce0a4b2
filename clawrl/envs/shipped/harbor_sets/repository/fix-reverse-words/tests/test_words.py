import unittest

from textkit.words import reverse_words


class ReverseTest(unittest.TestCase):
    def test_two(self):
        self.assertEqual(reverse_words("hello world"), "world hello")

    def test_three(self):
        self.assertEqual(reverse_words("a bc def"), "def bc a")

    def test_spaces(self):
        self.assertEqual(reverse_words("  one   two "), "two one")
