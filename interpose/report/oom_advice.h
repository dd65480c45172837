// Concrete advice for an out-of-memory event, drawn from its numbers.
#pragma once

#include <string>

#include "report/report_model.h"

namespace gpushim {

// `policy` is the policy name in force. Returns one or more sentences, no newline.
std::string oom_advice(const OomReport& oom, const std::string& policy);

}  // namespace gpushim
