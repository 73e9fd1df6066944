//! The SVG charts of a run: grouped bars per contender, and stacked bars of the
//! whole bill's parts.

use std::path::Path;

use crate::rig::CONTENDERS;

pub type Panel = (String, Vec<String>, Vec<[f64; 3]>);

/// One color per contender, in `CONTENDERS` order, in every chart of a run.
pub const COLORS: [plotters::style::RGBColor; 3] = [
    plotters::style::RGBColor(200, 80, 30),
    plotters::style::RGBColor(50, 110, 180),
    plotters::style::RGBColor(90, 160, 70),
];

/// The legend of a chart, in its upper right corner.
pub fn draw_legend<'a, 'b: 'a>(
    chart: &mut plotters::chart::ChartContext<
        'a,
        plotters::prelude::SVGBackend<'b>,
        plotters::prelude::Cartesian2d<
            plotters::coord::types::RangedCoordf64,
            plotters::coord::types::RangedCoordf64,
        >,
    >,
) {
    use plotters::prelude::*;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .unwrap();
}

/// Writes an SVG of stacked panels of grouped bars (one bar per contender per group).
pub fn draw_bars(path: &Path, panels: &[Panel]) {
    use plotters::prelude::*;
    let colors = COLORS;
    let height = 330 * u32::try_from(panels.len()).unwrap();
    // Wide enough for every group's label (the full matrix has 36 cells).
    let groups = panels.iter().map(|p| p.1.len()).max().unwrap_or(1);
    let width = u32::try_from(groups * 140).unwrap().max(1000);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let areas = root.split_evenly((panels.len(), 1));
    for (area, (title, groups, values)) in areas.iter().zip(panels) {
        let n = groups.len();
        let top = values.iter().flatten().copied().fold(0.0, f64::max) * 1.4;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .unwrap();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.01 && i < n {
                    groups[i].clone()
                } else {
                    String::new()
                }
            })
            .draw()
            .unwrap();
        for (k, contender) in CONTENDERS.iter().enumerate() {
            let color = colors[k];
            chart
                .draw_series(values.iter().enumerate().map(|(i, v)| {
                    let x0 = i as f64 + 0.15 + k as f64 * 0.233;
                    Rectangle::new([(x0, 0.0), (x0 + 0.21, v[k])], color.filled())
                }))
                .unwrap()
                .label(contender.name())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        draw_legend(&mut chart);
    }
    root.present().unwrap();
}

/// One color per part of the whole bill, in `whole::PARTS` order.
pub const PART_COLORS: [plotters::style::RGBColor; 8] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(174, 199, 232),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(255, 187, 120),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(127, 127, 127),
];

/// A panel of stacked bars: its title, and per bar its name and one value per part.
pub type StackedPanel = (String, Vec<(String, Vec<f64>)>);

/// Writes an SVG of panels of stacked bars, one block per part (`parts` names them).
pub fn draw_stacked(path: &Path, panels: &[StackedPanel], parts: &[&str]) {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 380 * u32::try_from(panels.len()).unwrap()))
        .into_drawing_area();
    root.fill(&WHITE).unwrap();
    let areas = root.split_evenly((panels.len(), 1));
    for (area, (title, bars)) in areas.iter().zip(panels) {
        let n = bars.len();
        let top = bars
            .iter()
            .map(|(_, v)| v.iter().sum::<f64>())
            .fold(0.0, f64::max)
            * 1.7; // room for the legend above the bars
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n as f64, 0.0..top.max(1e-9))
            .unwrap();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.01 && i < n {
                    bars[i].0.clone()
                } else {
                    String::new()
                }
            })
            .draw()
            .unwrap();
        for (k, name) in parts.iter().enumerate() {
            let color = PART_COLORS[k % PART_COLORS.len()];
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, values))| {
                    let below: f64 = values[..k].iter().sum();
                    let x0 = i as f64 + 0.2;
                    Rectangle::new([(x0, below), (x0 + 0.6, below + values[k])], color.filled())
                }))
                .unwrap()
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        draw_legend(&mut chart);
    }
    root.present().unwrap();
}
