// plumb::Error (public: code built on plumb's API throws and catches the same type), fail() and PLUMB_CHECK.
#pragma once
#include "plumb/check.h"
