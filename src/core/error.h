// plumb::Error, fail() and PLUMB_CHECK live in the public header (code built on plumb's API throws and catches
// the same type).
#pragma once
#include "plumb/error.h"
