import unittest

from textkit.count import word_count


class CountTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(word_count("one two three"), 3)

    def test_newlines(self):
        self.assertEqual(word_count("a\nb\tc"), 3)

    def test_empty(self):
        self.assertEqual(word_count(""), 0)
