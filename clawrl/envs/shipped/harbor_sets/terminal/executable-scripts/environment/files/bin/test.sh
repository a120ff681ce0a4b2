echo test
