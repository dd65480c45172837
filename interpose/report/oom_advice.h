// Concrete advice for an out-of-memory event, drawn from its numbers.
#pragma once

#include <string>

#include "report/report_model.h"

namespace gpushim {

// `policy` is the policy name in force. Returns one or more sentences, no newline.
std::string oom_advice(const OomReport& oom, const std::string& policy);

// A sentence naming the site whose live memory kept growing on the error's device from before the
// error, when the run's growth verdict has one: a leak filling the device (or the cap) looks, at
// the moment it fails, like any other live memory, and the largest live site is then often the
// model, not the culprit. "" when there is none.
std::string oom_growth_hint(const OomReport& oom, const GrowthReport& growth);

}  // namespace gpushim
