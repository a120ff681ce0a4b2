def reverse_words(sentence):
    return sentence[::-1]
