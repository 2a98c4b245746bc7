#include <gtest/gtest.h>
TEST(I, Y) {}
