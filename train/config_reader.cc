#include "train/config_reader.h"

#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/input_file.h"

namespace hap::train::detail {
namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The valid key a misspelled one most likely meant, when one is close enough to be a typo.
std::optional<std::string_view> likely_meant(std::string_view key,
                                             std::span<const std::string_view> keys) {
  std::optional<std::string_view> best;
  std::size_t best_distance = std::min<std::size_t>(2, key.size() / 2);
  for (std::string_view candidate : keys) {
    const std::size_t distance = edit_distance(key, candidate);
    if (distance <= best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace

std::string show(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "an empty value";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::string unknown_key_problem(std::string_view section, std::string_view key,
                                std::span<const std::string_view> keys) {
  std::string problem =
      section.empty() ? "unknown section; valid sections: " + join(keys)
                      : "unknown key; valid keys of " + std::string(section) + ": " + join(keys);
  if (const auto meant = likely_meant(key, keys))
    problem += " (did you mean '" + std::string(*meant) + "'?)";
  return problem;
}

void fail(const Origin& origin, std::string_view key_path, std::string_view problem) {
  std::string message = origin.file + ": ";
  if (!key_path.empty()) message.append(key_path).append(": ");
  message.append(problem);
  if (const auto it = origin.overrides.find(key_path); it != origin.overrides.end())
    message += " (value from " + it->second + ")";
  throw ConfigError(message);
}

SectionReader::SectionReader(const Origin& origin, std::string section, const YAML::Node& node,
                             std::span<const std::string_view> keys)
    : origin_(origin), section_(std::move(section)), keys_(keys) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap())
    fail(origin_, section_, "expected " + mapping_expectation() + ", got " + show(node));
  for (const auto& entry : node) {
    if (!entry.first.IsScalar())
      fail(origin_, section_, "expected key names, got " + show(entry.first) + " as a key");
    const std::string& key = entry.first.Scalar();
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end())
      fail(origin_, path(key), unknown_key_problem(section_, key, keys_));
    // yaml-cpp keeps both entries of a repeated key and finds the first; the user meant one.
    if (!entries_.emplace(key, entry.second).second)
      fail(origin_, path(key), "duplicate key; each key may appear once");
  }
}

SectionReader SectionReader::section(std::string_view key, std::span<const std::string_view> keys,
                                     bool optional) {
  const std::optional<YAML::Node> node = find(key);
  SectionReader reader(origin_, path(key), node.value_or(YAML::Node()), keys);
  if (!node && !optional)
    fail(origin_, path(key), "missing required section; expected " + reader.mapping_expectation());
  return reader;
}

double SectionReader::number(std::string_view key, std::optional<double> fallback,
                             const RealRange& bounds) {
  const std::string expected = bounds.expectation("a number");
  const std::optional<YAML::Node> node = find(key);
  if (!node) return required(key, fallback, expected);
  const std::string text = unquoted_scalar(key, *node, "a number");
  double value = 0.0;
  if (!parse_number(text, value)) fail(origin_, path(key), "expected a number, got '" + text + "'");
  if (!bounds.contains(value)) fail(origin_, path(key), "expected " + expected + ", got " + text);
  return value;
}

bool SectionReader::boolean(std::string_view key, std::optional<bool> fallback) {
  const std::optional<YAML::Node> node = find(key);
  if (!node) return required(key, fallback, "true or false");
  const std::string text = unquoted_scalar(key, *node, "true or false");
  if (text == "true") return true;
  if (text == "false") return false;
  fail(origin_, path(key), "expected true or false, got '" + text + "'");
}

std::string SectionReader::string(std::string_view key, std::optional<std::string> fallback,
                                  bool allow_empty) {
  const std::string expected = allow_empty ? "a string" : "a non-empty string";
  const std::optional<YAML::Node> node = find(key);
  if (!node) return required(key, std::move(fallback), expected);
  if (node->IsNull() && allow_empty) return "";
  if (!node->IsScalar()) fail(origin_, path(key), "expected " + expected + ", got " + show(*node));
  if (node->Scalar().empty() && !allow_empty)
    fail(origin_, path(key), "expected " + expected + ", got ''");
  return node->Scalar();
}

std::string SectionReader::names(std::string_view key, std::optional<std::string> fallback) {
  const std::optional<YAML::Node> node = find(key);
  if (node && !node->IsSequence() && !node->IsScalar() && !node->IsNull())
    fail(origin_, path(key),
         "expected names separated by commas, or a list of names, got " + show(*node));
  if (!node || !node->IsSequence()) return string(key, std::move(fallback), /*allow_empty=*/true);
  if (node->size() == 0)
    fail(origin_, path(key),
         "expected at least one name, got an empty list (for none, leave " + path(key) +
             " out or set it to \"\")");
  std::string joined;
  for (size_t i = 0; i < node->size(); ++i) {
    const YAML::Node item = (*node)[i];
    const std::string where = path(key) + "[" + std::to_string(i) + "]";
    if (!item.IsScalar()) fail(origin_, where, "expected a name, got " + show(item));
    const std::string& name = item.Scalar();
    if (name.empty() || name.find(',') != std::string::npos)
      fail(origin_, where, "expected a non-empty name without a comma, got '" + name + "'");
    joined += (i ? ", " : "") + name;
  }
  return joined;
}

void SectionReader::fail_value(std::string_view key, std::string_view expectation) const {
  const auto it = entries_.find(key);
  const std::string got = it == entries_.end()    ? "nothing"
                          : it->second.IsScalar() ? it->second.Scalar()
                                                  : show(it->second);
  fail(origin_, path(key), "expected " + std::string(expectation) + ", got " + got);
}

void SectionReader::finish() const {
  for (std::string_view key : keys_)
    HAP_ASSERT(read_.contains(key), "config key ", path(key), " is declared but never read");
}

std::string SectionReader::path(std::string_view key) const {
  return section_.empty() ? std::string(key) : section_ + "." + std::string(key);
}

bool SectionReader::has(std::string_view key) const { return entries_.find(key) != entries_.end(); }

std::optional<YAML::Node> SectionReader::find(std::string_view key) {
  HAP_ASSERT(std::find(keys_.begin(), keys_.end(), key) != keys_.end(), "config key ", path(key),
             " is read but not declared");
  read_.emplace(key);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::string SectionReader::unquoted_scalar(std::string_view key, const YAML::Node& node,
                                           std::string_view noun) const {
  if (!node.IsScalar())
    fail(origin_, path(key), "expected " + std::string(noun) + ", got " + show(node));
  if (node.Tag() == "!")
    fail(origin_, path(key),
         "expected " + std::string(noun) + ", got the quoted string " + show(node) +
             " (remove the quotes)");
  return node.Scalar();
}

std::string SectionReader::mapping_expectation() const {
  return "a mapping with keys " + join(keys_);
}

namespace {

// Notes where each YAML document starts, and nothing else.
class DocumentCounter : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

YAML::Node parse_yaml_file(const Origin& origin, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(origin.file, ec))
    fail(origin, "",
         "cannot read the " + std::string(what) + ": it is a directory, expected a YAML file");
  if (const std::string why = unreadable_reason(origin.file, kMaxConfigBytes, nullptr, false);
      !why.empty())
    fail(origin, "", "cannot read the " + std::string(what) + ": it " + why);
  std::ifstream in(origin.file, std::ios::binary);
  if (!in) fail(origin, "", "cannot read the " + std::string(what) + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    fail(origin, "", "cannot read the " + std::string(what) + ": " + std::strerror(errno));

  // A write or copy cut short at a random byte almost never ends at a newline, and a value cut
  // mid-line ("steps: 2" of "steps: 20") would otherwise read as another valid value.
  const std::string& body = text.str();
  if (!body.empty() && body.back() != '\n') {
    const std::size_t line_start = body.find_last_of('\n') + 1;  // npos + 1 == 0
    std::string last = body.substr(line_start);
    if (last.size() > 60) last = last.substr(0, 60) + "...";
    fail(
        origin, "",
        "the file does not end with a newline: it looks cut short (truncated) in its last line \"" +
            last + "\"; a complete file ends with a newline");
  }
  // YAML is Unicode text; the names and paths in it end up in JSON logs and plans.
  if (const std::size_t bad = invalid_utf8_at(body); bad != std::string::npos) {
    const std::size_t line =
        static_cast<std::size_t>(
            std::count(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(bad), '\n')) +
        1;
    const std::size_t line_start = body.rfind('\n', bad == 0 ? 0 : bad - 1);
    const std::size_t column =
        bad - (line_start == std::string::npos || bad == 0 ? 0 : line_start + 1) + 1;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(body[bad]));
    fail(origin, "",
         "the file is not UTF-8 text: byte " + std::string(byte) + " at line " +
             format_number(line) + ", column " + format_number(column) + " (save it as UTF-8)");
  }
  YAML::Node document;
  try {
    // Counted first, event by event: yaml-cpp's LoadAll never returns on some malformed text (a
    // stray ',' where a block starts makes it yield empty documents forever, until memory runs
    // out), and the parser then restarts each document at the same place.
    DocumentCounter counter;
    std::istringstream in(body);
    YAML::Parser parser(in);
    while (counter.marks.size() < 2 && parser.HandleNextDocument(counter)) {
      const std::size_t n = counter.marks.size();
      if (n >= 2 && counter.marks[n - 1].pos == counter.marks[n - 2].pos)
        fail(origin, "",
             "YAML syntax error at line " + format_number(counter.marks[n - 1].line + 1) +
                 ", column " + format_number(counter.marks[n - 1].column + 1) +
                 ": a token that cannot start a block (a stray ',' or ']'?)");
    }
    if (counter.marks.size() > 1)
      fail(origin, "",
           "expected one YAML document, found another one at line " +
               format_number(counter.marks[1].line + 1));
    document = YAML::Load(body);
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null())
      where = " at line " + format_number(e.mark.line + 1) + ", column " +
              format_number(e.mark.column + 1);
    // yaml-cpp reports a tab in the indentation as some other error: name it.
    std::string tab;
    std::istringstream lines(text.str());
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      const std::size_t indent = line.find_first_not_of(" \t");
      if (line.find('\t') < std::min(indent, line.size())) {
        tab = " (line " + format_number(n) +
              " is indented with a tab; YAML indents with spaces only)";
        break;
      }
    }
    fail(origin, "", "YAML syntax error" + where + ": " + e.msg + tab);
  }
  return document;
}

}  // namespace hap::train::detail
