// The one JSON string escaper, for every document gpushim writes: the shim's reports and
// gpushim-analyze's outputs alike.
#pragma once

#include <string>
#include <string_view>

namespace gpushim {

// Appends `s` as a JSON string literal (quotes included). Symbol names, paths and Python file
// names are arbitrary bytes; the document must stay valid JSON whatever they hold, so bytes that
// are not well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF)
// become U+FFFD, and control characters are escaped.
void append_json_string(std::string* out, std::string_view s);

}  // namespace gpushim
