//! The SVG bar chart of a run.

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
